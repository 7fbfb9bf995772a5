"""Packaging for PaSE: the ``pase`` library, the built-in ``graphs`` and the CLI."""

from setuptools import setup

setup(
    name="pase",
    version="0.2.0",
    description="Exact parallelization strategies for DNN training (PaSE, IPDPS 2021)",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    # Every package (pase has one sub-package per stage); tests/test_packaging.py checks the list.
    packages=[
        "graphs",
        "pase",
        "pase.cli",
        "pase.core",
        "pase.costing", "pase.costing.training",
        "pase.machines",
        "pase.model",
        "pase.model.layers",
        "pase.outputs",
        "pase.outputs.jax", "pase.outputs.torch",
        "pase.planning",
        "pase.search",
        "pase.sources",
        "pase.sources.torch",
        "pase.sources.torch.handlers",
    ],
    # The measured tables of the calibrated machine presets (pase/machines/data), the engine
    # profiles (pase/planning/engines) and the parallel rules (pase/planning/data).
    package_data={"pase.machines": ["data/*.json"], "pase.planning": ["engines/*.json", "data/*.json"]},
    py_modules=["scheduler"],
    python_requires=">=3.9",
    install_requires=["networkx>=2.6", "numpy>=1.22", "pydot>=1.4", "tqdm>=4.60"],
    # Optional: importing PyTorch models and `pase calibrate` (torch); running plans (jax);
    # Hugging Face configs of model types read through transformers (hf); the engines'
    # configuration code that checks the exports in the tests (engines; megatron-core 0.16 for its
    # pipeline layouts and tokenizers; torchtitan 0.3, whose launch --export-torchtitan writes;
    # torchtitan 0.2.2, whose TOML job files it writes with --engine torchtitan,version=0.2, is
    # installed apart by .ci/run, as the two cannot share an environment); DeepSpeed without
    # building its ops (DS_BUILD_OPS=0).
    extras_require={"torch": ["torch>=2.1"], "jax": ["jax>=0.4.30"], "hf": ["torch>=2.1", "transformers>=4.40"],
                    "engines": ["megatron-core>=0.16", "deepspeed>=0.16", "torchtitan>=0.3,<0.4"]},
    entry_points={"console_scripts": ["pase = pase._entry:run"]},
)
