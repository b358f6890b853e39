"""Several servers: federated booking over SSH (SPEC 12, docs/CLUSTER.md).

``catalog`` reads and writes the root-owned node list; ``identity`` is what
makes a node this node; ``node`` runs one command on one node and checks who
answered; ``fanout`` asks all nodes at once; ``client`` is the operations
(overview, check, recommend, book on the best node, edit, cancel) with the
op-id protocol that makes a lost reply safe; ``serve`` is the node's half,
one row run here for a client.  The SSH process itself is
``bk.remote.ssh``.
"""
