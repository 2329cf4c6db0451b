"""What training and rollout both need: rank set-up and FSDP2 (`distributed`), the dispatch modes of a
worker's methods, model-support checks and the process RNG."""
