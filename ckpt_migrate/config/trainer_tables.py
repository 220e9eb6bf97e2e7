"""The tables of the 2.3 Trainer layout: where each key of a legacy params.yaml goes under
``trainer:``, in the Trainer's order, and the learning-rate schedulers it knows.

From Model Zoo's ``TRAINER_PARAMS_TO_LEGACY`` table and ``convert_legacy_params_to_trainer_params``
(``src/cerebras/modelzoo/trainer/utils.py``, MODELZOO_HISTORY.md §3.6, §4.5); applied by
``config.trainer_layout``.
"""

from __future__ import annotations

WHY = "2.3 trainer layout"

# runconfig key -> path under trainer.init (in the order the Trainer's YAML lists them).
RUNCONFIG_TO_INIT: dict[str, tuple[str, ...]] = {
    "model_dir": ("model_dir",),
    "seed": ("seed",),
    "target_device": ("backend", "backend_type"),
    "compile_dir": ("backend", "compile_dir"),
    "compile_only": ("backend", "compile_only"),
    "validate_only": ("backend", "validate_only"),
    "num_csx": ("backend", "cluster_config", "num_csx"),
    "num_wgt_servers": ("backend", "cluster_config", "max_wgt_servers"),
    "mgmt_address": ("backend", "cluster_config", "mgmt_address"),
    "mgmt_namespace": ("backend", "cluster_config", "mgmt_namespace"),
    "credentials_path": ("backend", "cluster_config", "credentials_path"),
    "mount_dirs": ("backend", "cluster_config", "mount_dirs"),
    "python_paths": ("backend", "cluster_config", "python_paths"),
    "num_workers_per_csx": ("backend", "cluster_config", "num_workers_per_csx"),
    "num_act_servers": ("backend", "cluster_config", "max_act_per_csx"),
    "job_labels": ("backend", "cluster_config", "job_labels"),
    "job_priority": ("backend", "cluster_config", "job_priority"),
    "job_time_sec": ("backend", "cluster_config", "job_time_sec"),
    "disable_version_check": ("backend", "cluster_config", "disable_version_check"),
    "enable_distributed": ("backend", "enable_distributed"),
    "main_process_id": ("backend", "main_process_id"),
    "dist_backend": ("backend", "dist_backend"),
    "init_method": ("backend", "init_method"),
    "sync_batchnorm": ("backend", "sync_batchnorm"),
    "precision_opt_level": ("precision", "precision_opt_level"),
    "num_steps": ("loop", "num_steps"),
    "max_steps": ("loop", "max_steps"),
    "num_epochs": ("loop", "num_epochs"),
    "steps_per_epoch": ("loop", "steps_per_epoch"),
    "eval_frequency": ("loop", "eval_frequency"),
    "eval_steps": ("loop", "eval_steps"),
    "checkpoint_steps": ("checkpoint", "steps"),
    "disable_strict_checkpoint_loading": ("checkpoint", "disable_strict_checkpoint_loading"),
    "autoload_last_checkpoint": ("checkpoint", "autoload_last_checkpoint"),
    "save_initial_checkpoint": ("checkpoint", "save_initial_checkpoint"),
    "log_steps": ("logging", "log_steps"),
    "logging": ("logging", "log_level"),
    "wsc_log_level": ("logging", "wsc_log_level"),
    "enable_act_frequency": ("logging", "enable_act_frequency"),
}
MODEL_TO_PRECISION = {"mixed_precision": "enabled", "fp16_type": "fp16_type"}
OPTIMIZER_TO_PRECISION = {
    "loss_scaling_factor": "loss_scaling_factor",
    "initial_loss_scale": "initial_loss_scale",
    "steps_per_increase": "steps_per_increase",
    "min_loss_scale": "min_loss_scale",
    "max_loss_scale": "max_loss_scale",
    "max_gradient_norm": "max_gradient_norm",
    "max_gradient_value": "max_gradient_value",
    "log_summaries": "log_loss_scale",
}
PRECISION_ORDER = (
    "enabled",
    "fp16_type",
    "precision_opt_level",
    *OPTIMIZER_TO_PRECISION.values(),
)
INIT_ORDER = (
    "model_dir",
    "seed",
    "backend",
    "model",
    "optimizer",
    "schedulers",
    "precision",
    "sparsity",
    "loop",
    "checkpoint",
    "logging",
    "callbacks",
    "loggers",
)
# runconfig keys that become GlobalFlags (csx.* flags).
GLOBAL_FLAGS = {
    "transfer_processes": "csx.performance.transfer_processes",
    "ini": "csx.debug.ini",
    "debug_args": "csx.debug.debug_args",
    "retrace_every_iteration": "csx.debug.retrace_every_iteration",
    "lazy_initialization": "csx.debug.lazy_initialization",
    "log_initialization": "csx.debug.log_initialization",
    "drop_data": "csx.debug.drop_data",
    "fabric_type_blacklist": "csx.debug.fabric_type_blacklist",
    **{
        f"{m}_memory_gi": f"csx.debug.{m}_memory_gi"
        for m in ("compile_crd", "execute_crd", "wrk", "act", "cmd", "wgt", "chf")
    },
}
# (callback, argument or None when the value is the whole callback setting, source).
CALLBACKS: tuple[tuple[str, str | None, tuple[str, str]], ...] = (
    ("DebugArgsPath", "debug_args_path", ("runconfig", "debug_args_path")),
    ("Lora", "lora_params", ("model", "lora_params")),
    ("LogInputSummaries", None, ("runconfig", "log_input_summaries")),
    ("CheckLoss", None, ("runconfig", "check_loss_values")),
    ("ComputeNorm", None, ("optimizer", "log_summaries")),
    ("LoadCheckpointStates", "load_checkpoint_states", ("runconfig", "load_checkpoint_states")),
    ("KeepNCheckpoints", "n", ("runconfig", "max_checkpoints")),
    ("LogSparsity", None, ("sparsity", "add_summaries")),
    ("WeightCompression", "compressions", ("model", "compression")),
    ("SelectiveGrad", "selective_grads", ("model", "selective_grad")),
    ("Listener", None, ("runconfig", "experimental")),
    ("OpProfiler", None, ("runconfig", "op_profiler_config")),
    ("DumpActivations", None, ("runconfig", "dump_activations")),
    ("HFCacheDir", "cache_dir", ("runconfig", "hf_cache_dir")),
)
TENSORBOARD = ("summary_dir", "legacy_event_dirs")
WANDB = ("project", "group", "run_id", "run_name", "job_type", "tags", "resume", "entity")
# cstorch LR scheduler classes (cerebras-pytorch 2.10 ``optim/lr_scheduler.py``), for
# ``scheduler: "Linear"`` -> ``LinearLR`` (the name itself or the name + "LR").
LR_SCHEDULERS = (
    "ConstantLR",
    "PolynomialLR",
    "LinearLR",
    "ExponentialLR",
    "InverseExponentialTimeDecayLR",
    "InverseSquareRootDecayLR",
    "CosineDecayLR",
    "SequentialLR",
    "PiecewiseConstantLR",
    "MultiStepLR",
    "StepLR",
    "CosineAnnealingLR",
    "LambdaLR",
    "CosineAnnealingWarmRestarts",
    "MultiplicativeLR",
    "ChainedLR",
    "CyclicLR",
    "OneCycleLR",
    "ScalePerParamLR",
)
LEGACY_SECTIONS = ("train_input", "eval_input", "model", "optimizer", "sparsity", "runconfig")


def scheduler_class(name: str) -> str | None:
    by_lower = {c.lower(): c for c in LR_SCHEDULERS}
    low = name.strip().lower()
    return by_lower.get(low) or by_lower.get(f"{low}lr")
