"""`zbdlab reproduce`: every headline figure of the seeds, measured here, beside the published numbers.

model.py     what a reproduction is (seed numbers, how to measure ours, how to compare) and its outcome
context.py   what a reproduction's measure() may run (studies via `zbdlab run`, zbd benches), recorded
seed00N.py   the entries, one module per seed document
datasets.py  the data types of the ZBD paper's Table II, from files on this machine
pipeline.py  runs the entries resumably, stores outcomes, renders
render.py    outcomes -> reproduction.md and reproduction.html (golden-tested), plus plots
"""
