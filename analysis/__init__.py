"""Plots and tables made from run folders."""
