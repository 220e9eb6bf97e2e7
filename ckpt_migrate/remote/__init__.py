"""Checkpoints in object storage (``s3://``) and fleets of upgrades on a Dask cluster.

The optional packages (boto3, dask.distributed) are imported only when a command needs them;
without them the command ends with a one-line install hint (exit 2).
"""
