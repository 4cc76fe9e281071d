"""JSON Schemas of the event types tuneloop knows, shipped as package data."""
