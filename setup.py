"""Packaging for PaSE: the ``pase`` library, the built-in ``graphs`` and the CLI."""

from setuptools import setup

setup(
    name="pase",
    version="0.2.0",
    description="Exact parallelization strategies for DNN training (PaSE, IPDPS 2021)",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=["pase", "graphs"],
    py_modules=["scheduler"],
    python_requires=">=3.9",
    install_requires=["networkx>=2.6", "numpy>=1.22", "pydot>=1.4", "tqdm>=4.60"],
    entry_points={"console_scripts": ["pase = pase._entry:run"]},
)
