"""A container's health check for its worker: healthy while a worker of this host has its heartbeat in
Redis. (`celery inspect ping` needs Celery's remote control, which is off: see chatsite/settings.py.)"""

import os
import socket
import sys

import redis

from inference.transport import WORKER_KEY_PREFIX


def main() -> int:
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), socket_connect_timeout=5)
    beating = next(client.scan_iter(match=f"{WORKER_KEY_PREFIX}{socket.gethostname()}:*", count=1000), None)
    if beating is None:
        print(f"no worker of {socket.gethostname()} has its heartbeat in Redis", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
