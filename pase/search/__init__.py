"""The search on bare graphs (a cost vector per vertex, a cost matrix per edge): orderings,
blocks of identical layers, the dynamic programme and the memory-capped search. It knows
nothing about neural networks and imports nothing of pase but ``pase.core``."""
