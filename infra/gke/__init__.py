"""The GKE engine: a regional cluster whose TPU slice node pools run researchers' jobs, JobSet and Kueue,
and a queue per team.

- `specs`: pure. The shape of a slice pool (`SliceShape`: what a queue's flavor and a job select) and
  the arguments of its node pools and workload policy, as plain data, compared with what
  `xpk==1.16.0` builds (tests/xpk/);
- `cluster`: the cluster, its node service account and system pool (a component);
- `slice_pools`: one slice pool: a node pool per slice, and TPU7x's workload policy (a component);
- `controllers`: pure. JobSet and Kueue pinned, and the objects the admin phase installs;
- `queues`, `quota`: pure. Teams as Kueue objects, and Kueue's quota arithmetic;
- `teams`: pure. Each team's namespace, service account and RBAC;
- `jobsets`: pure. A team's JobSet on a pool shape;
- `crds`, `validation`: pure. Our reduced CRDs of the JobSet and Kueue kinds we render, and the
  validator of every Kubernetes object the platform hands to a cluster;
- `install`: the components that hand objects to a cluster; `admin`: the admin phase's program (gke-admin/);
- `team_access`: what each team's code and members may do on the GCP side (a component).
"""
