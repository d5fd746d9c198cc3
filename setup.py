from setuptools import find_packages, setup

setup(
    name="anisotropy-pipeline",
    version="0.1.0",
    description="Diagnose and correct the geometry (narrow cone / anisotropy) of embedding corpora on Spark + Delta Lake",
    packages=find_packages(include=["anisotropy_core*", "anisotropy_spark*", "jobs*"]),
    python_requires=">=3.10",
    entry_points={"console_scripts": ["anisotropy=jobs.cli:main"]},
    install_requires=[
        "numpy>=1.26",
        "pyarrow>=15",
        "pandas>=2.0",
        "PyYAML>=6",
        "matplotlib>=3.8",
        "faiss-cpu>=1.8",
    ],
    extras_require={
        "spark": ["pyspark>=4.0,<4.1", "delta-spark>=4.0,<4.1"],
        "test": ["pytest>=8", "chispa>=0.10"],
    },
)
