"""In-process controllers of a logical cluster (garbage collector, workloads) and the
small framework they share. `manager.Manager` is what `LogicalCluster` starts."""
