"""What a batch is made of: tasks, requests, schemas and the JSON a model returns (docs/design.md's
module map). May import fingerprints and the flat modules; never providers or anything above."""
