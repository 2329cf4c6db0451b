"""Worker processes: `policy.PolicyWorker` hosts a rank's roles over `training/` and `rollout/`, which
do not import each other; both sit on `common/`."""
