"""The Ray backend: ``RaySupervisor`` runs a local ``Supervisor`` on every node.

    driver.py   RaySupervisor: a call on its slot's node, its requests served in the host
    nodes.py    the cluster as the host sees it: nodes, agents, placement, a node lost
    agent.py    the agent actor of one node (imports ray)
    relay.py    a call's requests between agent and host, both ends
    cluster_metrics.py  every node's metrics() made one, call rows labelled by node

ray itself is imported only when a RaySupervisor first needs it."""
