"""The worker's internal partitions: how many there are, and growing them under a new group.

A worker group's internal topics (the keyed topic `<group>-tuneloop-keyed` and each Table's
changelog `<group>-<table>-changelog`) all have `TUNELOOP_KAFKA_INTERNAL_PARTITIONS`
partitions, and a key's state lives on the partition its rule key hashes to. The count can't
change under a group, so growing it means a new group with the state moved over
(docs/partitions.md):

- `placing.py`: which partition a rule key goes to (the producer's murmur2), and which of an
  entry's possible rule keys is the true one. Pure.
- `entries.py`: for every Table of the worker, how an entry names its rule key, and what an
  entry must say about its new partition. Pure.
- `cluster.py`: what the brokers say: topics and their partition counts, groups' members and
  committed offsets, creating topics.
- `guard.py`: `tuneloop run` refuses to start a group whose internal topics have another
  count than the settings say.
- `growing.py`: `tuneloop partitions grow`, the migration to a new group with more partitions.
"""
