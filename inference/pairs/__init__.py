"""Main/draft pairs on disk: `importer` (GGUF or Hugging Face to OpenVINO IR, run by a worker with
the train extra), `conversion` (its steps as processes of their own), `gguf` and `catalog` (the pairs
`make real-pair` installs). Nothing here serves requests."""
