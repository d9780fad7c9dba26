"""What `rocmtrain pool`, `status` and `plot` show, computed from plain API objects (pure).

`pool` (the GPU pool per GPU model, its holders, Kueue's queues), `job` (one job on one
screen), `curves` (loss and accuracy curves from a job's status or a local run's log),
`table` (aligned text tables). The commands that read the objects and draw are in
`rocmtrain.cli.cluster` and `rocmtrain.cli.plot`.
"""
