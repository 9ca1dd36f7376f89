"""The GKE engine: a regional cluster whose TPU slice node pools run researchers' jobs.

- `specs`: pure. The shape of a slice pool (`SliceShape`: what a queue's flavor and a job select) and
  the arguments of its node pools and workload policy, as plain data, compared with what
  `xpk==1.16.0` builds (tests/xpk/);
- `cluster`: the cluster, its node service account and system pool (a component);
- `slice_pools`: one slice pool: a node pool per slice, and TPU7x's workload policy (a component).
"""
