"""The driver side of an elastic job: a pure core that decides, and a Ray shell that gathers events and acts."""
