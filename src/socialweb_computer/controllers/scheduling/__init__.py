"""The pieces of the default scheduler that need no store: quantities and pod requests
(`resources`), per-node bookkeeping (`cache`), filters and their reasons (`predicates`),
scoring (`scoring`), victim selection (`preemption`) and the priority queue (`queue`).
`controllers.scheduler` ties them to the informers and the store."""
