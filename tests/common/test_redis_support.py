"""The redis_url fixture starts a real server (other suites rely on it)."""

import redis


def test_real_redis_server(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.set("helios", "up")
    assert client.get("helios") == b"up"
