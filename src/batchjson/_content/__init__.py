"""What a batch is made of: tasks, requests, schemas and the JSON a model returns.

Owns tasks, the requests they are packed into and the prompt text a request is sent as
(``tasks``), every key of a run or an import and the answer source (``keys``), answer schemas
and the per-call wire schema (``schema``), and reading a model's JSON strictly and comparing
JSON values exactly (``strictjson``), and the values a schema allows: the smallest answer a pack
can get, and values drawn from a seed (``schemavalues``, reading a schema's parts through
``schemaparts``, strings through ``patterngen``).

May import fingerprints and the flat modules; never providers or anything above them.
"""
