"""Elastic jobs: the driver's control loop, the rendezvous actor and the worker-side runtime."""
