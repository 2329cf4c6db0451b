"""The training jobs: actor, reference, critic and reward model, their forwards, micro-batches, update
loop, optimizers and training state. Knows nothing of how responses are generated (`workers.rollout`)."""
