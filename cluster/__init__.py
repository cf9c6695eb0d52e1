"""Reserved for the router mesh, Raft-held metadata and ISR replication (next issues).

Empty on purpose: the single-node broker and the commit log do not depend on it, and the
router already exposes what the cluster will need (a forwarder hook, log positions, fetch).
"""
