"""`make run` needs Redis: use the one at REDIS_URL, else start a local redis-server, else say how to get one."""

import shutil
import subprocess
import sys
import time
from urllib.parse import urlparse

import redis


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def main(url: str) -> int:
    if answers(url):
        return 0
    parsed = urlparse(url)
    local = parsed.hostname in {"127.0.0.1", "localhost", "::1"}
    server = shutil.which("redis-server")
    if local and server:
        port = str(parsed.port or 6379)
        subprocess.run([server, "--daemonize", "yes", "--bind", "127.0.0.1", "--port", port, "--save", ""], check=True)
        for _ in range(50):
            if answers(url):
                print(f"started redis-server on port {port}")
                return 0
            time.sleep(0.1)
    print(f"Redis does not answer at {url}: install it (apt-get install redis-server) or set REDIS_URL.",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
