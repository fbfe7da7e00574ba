"""In-tree backends, one subpackage each.  tealite.registry.IN_TREE_BACKENDS names them and
load_plugins() imports them as it imports plug-ins; each registers itself on import, and
importing one that cannot run here must still succeed (its probe reports why it is
unavailable)."""
