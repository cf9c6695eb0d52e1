"""The subscription trie and retained tree against a naive reference matcher (no sockets)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.retained import RetainedStore
from broker.trie import SubscriptionTrie

LEVELS = st.sampled_from(["a", "b", "c", "$SYS", ""])


def naive_match(flt: str, topic: str) -> bool:
    """MQTT 4.7 matching written the obvious way, as the oracle."""
    f, t = flt.split("/"), topic.split("/")
    if topic.startswith("$") and f[0] in ("+", "#"):
        return False  # [MQTT-4.7.2-1]
    for i, level in enumerate(f):
        if level == "#":
            return True
        if i >= len(t):
            return False
        if level != "+" and level != t[i]:
            return False
    return len(f) == len(t)


topics = st.lists(LEVELS, min_size=1, max_size=4).map("/".join)
FILTER_LEVELS = st.sampled_from(["a", "b", "c", "$SYS", "", "+"])
filters = st.lists(FILTER_LEVELS, min_size=1, max_size=4).flatmap(
    lambda lv: st.sampled_from(["/".join(lv), "/".join([*lv, "#"])])
)


@settings(max_examples=300)
@given(st.lists(filters, min_size=1, max_size=12, unique=True), topics)
def test_trie_matches_like_the_oracle(flts, topic):
    trie = SubscriptionTrie()
    for i, flt in enumerate(flts):
        trie.add(flt, f"c{i}", flt)
    got = sorted(sub for _cid, sub in trie.match(topic).subs)
    assert got == sorted(f for f in flts if naive_match(f, topic))


@settings(max_examples=200)
@given(st.lists(filters, min_size=1, max_size=12, unique=True), topics)
def test_remove_prunes_and_invalidates_cache(flts, topic):
    trie = SubscriptionTrie()
    for i, flt in enumerate(flts):
        trie.add(flt, f"c{i}", flt)
    trie.match(topic)  # fill the cache, then change the trie under it
    for i, flt in enumerate(flts):
        assert trie.remove(flt, f"c{i}")
    assert trie.match(topic).subs == []
    assert len(trie) == 0
    assert trie._root.children == {}


@settings(max_examples=300)
@given(st.lists(topics, min_size=1, max_size=12, unique=True), filters)
def test_retained_tree_matches_like_the_oracle(tops, flt):
    store = RetainedStore()
    for t in tops:
        store.set(t, t)
    assert sorted(store.match(flt)) == sorted(t for t in tops if naive_match(flt, t))


def test_shared_groups_are_per_name_and_filter():
    trie = SubscriptionTrie()
    trie.add("a/+", "c1", 1, group="g")
    trie.add("a/+", "c2", 2, group="g")
    trie.add("a/#", "c3", 3, group="g")
    groups = trie.match("a/x").groups
    assert sorted((g.name, g.filter, sorted(g.members)) for g in groups) == [
        ("g", "a/#", ["c3"]), ("g", "a/+", ["c1", "c2"])]
    trie.remove("a/+", "c1", group="g")
    assert [sorted(g.members) for g in trie.match("a/x").groups if g.filter == "a/+"] == [["c2"]]


def test_retained_delete_and_expiry():
    store = RetainedStore(expired=lambda msg, now: msg == "old")
    store.set("a/b", "old")
    store.set("a/c", "new")
    assert store.match("a/+") == ["new"]  # the expired one is dropped on read
    assert len(store) == 1
    store.delete("a/c")
    assert len(store) == 0 and store.match("#") == []
