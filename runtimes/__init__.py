"""Where training runs: Kubeflow TrainJobs, local processes, and the LoRA trainer itself."""
