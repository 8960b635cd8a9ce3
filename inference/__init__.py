"""Pairs, engines and the generation path: models and admin (web process), `serving` (web and worker
sides of a generation), `engines` (worker process, and the benchmark), `api` (REST, web process),
`benchmark`, `pairs` (checks, import, demo builders), `transport` (Redis Streams, both sides)."""
