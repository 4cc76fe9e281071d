"""tuneloop's event vocabulary: the types it understands, their data schemas, its own events.

- `registry.SchemaRegistry`: type -> JSON Schema of `data`, built-in plus user files.
- `output`: constructors of `io.tuneloop.finetune.{started,completed,failed}.v1`.
- `rejections.Rejection`: the stable codes of dead-lettered records.
- `timestamps`: the RFC 3339 rule shared by the codec and the schemas.

See docs/events.md for the vocabulary and docs/dead-letters.md for the codes.
"""

from orchestrator.vocabulary.output import EventType
from orchestrator.vocabulary.registry import SchemaRegistry
from orchestrator.vocabulary.rejections import Rejection

__all__ = ["EventType", "Rejection", "SchemaRegistry"]
