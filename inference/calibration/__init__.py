"""A pair's calibration on the host that serves it: what it measures (measure.py), what its figures decide
(verdicts.py), whose host (host.py), and the job that runs it on a worker and stores it (runs.py). The planner and
the engines' specs read the result."""
