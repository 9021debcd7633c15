"""Capacity planning (`inferd plan`): a fleet of simulated replicas, each running the server's own
scheduling code on a virtual clock, scaled by Kubernetes' HPA algorithm on a chosen signal."""
