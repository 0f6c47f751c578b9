from lru import LRUCache


def test_get_put():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1
