"""Scores of attack results against ground truth."""
