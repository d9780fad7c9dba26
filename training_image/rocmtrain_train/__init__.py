"""The training image: Ray Train + PyTorch DDP + transformers fine-tuning, and `rocmtrain run`.

A separate program from the operator: it imports `rocmtrain.api` (the contract) and
nothing else of `rocmtrain` but the planner, `rocmtrain.plan` (`tests/unit/test_boundary.py` enforces it).
One subpackage per stage, in layers, bottom to top; a module imports its own subpackage and the layers
below it, never a neighbour in its layer nor a layer above (the boundary test enforces this too):

1. `config`: run settings (the job from `ROCMTRAIN_JOB` or a file);
2. `storage`: locations (paths, object stores, the hub);
3. `data`: records, the batch plan, tokenising, prefetching (a language model's in `data.causal_lm`);
   `model`: finding and loading the pretrained model; `checkpoint`: the state to resume from, and the final
   model export; `reporting`: rank reports to the driver, aggregated into ProgressReports for the sinks;
4. `evaluation`: sharded evaluation, per task;
5. `tasks`: what the loop asks of the thing it trains, one module per task; `strategy`: how the model is
   spread over the ranks (data-parallel, sharded);
6. `loop`: one rank (set-up, its share of the data, the step loop, resource sampling);
7. `trainer`: Ray Train's TorchTrainer of one run;
8. `search`: a hyper-parameter search (Ray Tune trials of the run's TorchTrainer) and its status;
9. `driver`: a run on the driver (checks, a run or a search, its sinks; an embedded Ray locally);
10. `cli`: the `rocmtrain run` and `rocmtrain scale` subcommands (`rocmtrain.commands` entry points);
    `__main__`: the RayJob's driver (`python -m rocmtrain_train`); `sdk`: what a job's own code imports.
"""
