"""Collective backends: what each worker's environment needs so its training code can form a group."""
