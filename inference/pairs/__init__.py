"""Main/draft pairs on disk: `checks` (folders and tokenizers a pair must have, used by the admin and
the registry), `importer` (Hugging Face export, run by a worker with the train extra) and the demo
pair's builders. Nothing here serves requests."""
