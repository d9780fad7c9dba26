"""The planner (pure): what a job needs of its GPUs and nodes, from its spec and its model's config.

Importable by the training image as the contract is: the standard library, pydantic and `rocmtrain.api` only.
"""
