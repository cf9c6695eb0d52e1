"""Reserved for the router mesh, Raft-held metadata and ISR replication (next issues).

Empty on purpose: the single-node broker and the commit log do not depend on it, and the
router already has the seams the cluster will use: ``Router.route`` for forwarded messages,
log offsets on every stored message, and the fetch API for followers and readers.
"""
