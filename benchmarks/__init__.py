"""Benchmarks for mongo-saver against langgraph-checkpoint-mongodb and InMemorySaver.

Run ``python -m benchmarks.run [--quick] [--out docs/benchmarks]``; see ``benchmarks.run``.
"""
