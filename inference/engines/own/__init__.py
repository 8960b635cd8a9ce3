"""The own engine: exact speculative sampling on the OpenVINO runtime (`engine`), its caches and batch, and who
proposes its tokens (`proposers/`)."""
