"""What speculation buys for a pair on this machine: `inprocess` (engines driven directly), `stack`
(through daphne, a Celery worker and Redis), `runs` (runs started from the admin or manage.py) and
`report` (tables, plots, bars). Used by `manage.py benchmark` and, for admin runs, by the worker."""
