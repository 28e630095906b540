"""RunConfig's fields: one per run-config key (``foo-bar`` -> ``foo_bar``), typed, with its default.

Generated from the Setting declarations (config/general.py, the parts' specs algorithms/**/*_spec.py) by
``fedvls config --write``; do not edit (a test fails when this file is stale).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunConfigFields:
    #: the local objective (see docs/methods.md)
    method: str = "fedvls"
    #: the dataset
    dataset: str = "digits"
    #: where datasets live (relative paths: against $FEDVLS_BASE_DIR)
    data_dir: str = "~/fedvls-data"
    #: let torchvision download MNIST / Fashion-MNIST / CIFAR into data-dir
    download: bool = False
    #: label-skew scheme
    partition: str = "dirichlet"
    #: Dirichlet concentration (smaller = stronger skew)
    dirichlet_beta: float = 0.05
    #: shards (partition = shards) or classes (noniid-labeldir) per client
    shards_per_client: int = 2
    #: every Dirichlet client holds at least this many samples
    min_partition_size: int = 10
    #: partition, model initialisation, client sampling and batch order
    seed: int = 0
    #: the network; auto = the paper's model for the dataset
    model: str = "auto"
    #: > 0: a stratified fixed-seed subsample of the training pool of this size
    train_pool_size: int = 0
    #: Synthetic(alpha, beta): model heterogeneity
    synthetic_alpha: float = 1.0
    #: Synthetic(alpha, beta): data heterogeneity
    synthetic_beta: float = 1.0
    #: Synthetic: number of generated clients (= num-supernodes)
    synthetic_clients: int = 100
    #: rounds
    num_server_rounds: int = 30
    #: fraction of nodes sampled per round (R in the paper)
    fraction_train: float = 1.0
    #: nodes to wait for before the first round
    min_nodes: int = 2
    #: deployment: seconds to wait for min-nodes before the run fails
    min_nodes_timeout: float = 900.0
    #: seconds to wait for the replies of a round
    round_timeout: float = 3600.0
    #: a round needs usable replies from this fraction of the sampled clients
    min_fit_fraction: float = 0.5
    #: re-runs of a round that got too few usable replies
    round_retries: int = 1
    #: how the average becomes the next global model
    server_optimizer: str = "fedavg"
    #: the federation's shape: standard (one global model), or fedconcat (clusters, then one head over their encoders)
    protocol: str = "standard"
    #: local epochs per round
    local_epochs: int = 5
    #: local batch size
    batch_size: int = 64
    #: local SGD learning rate
    lr: float = 0.01
    #: local SGD momentum
    momentum: float = 0.9
    #: local SGD weight decay
    weight_decay: float = 1e-05
    #: how a client steps: sgd, sam (FedSAM's sharpness-aware step) or fedgf (FedGF)
    local_optimizer: str = "sgd"
    #: local momentum: fresh every round, or carried across rounds
    optimizer_state: str = "fresh"
    #: CIFAR-style training augmentation (RGB datasets only)
    augment: bool = True
    #: bfloat16 mixed precision on CUDA, training and server evaluation (auto: where measured faster)
    amp: str = "auto"
    #: channels-last memory format on CUDA (auto: where measured faster)
    channels_last: str = "auto"
    #: replay each client's training step as CUDA graphs on CUDA (ignored on a CPU)
    cuda_graphs: bool = True
    #: where clients train: auto (CUDA when present), cpu or cuda
    device: str = "auto"
    #: where the server evaluates: auto (CUDA when present, cpu when device = cpu), cpu or cuda
    server_device: str = "auto"
    #: bit-for-bit reproducible GPU runs (can be slower; docs/performance.md)
    deterministic: bool = False
    #: torch threads per client process
    torch_threads: int = 1
    #: evaluation batch size
    eval_batch_size: int = 1024
    #: where the global model is evaluated
    evaluation: str = "auto"
    #: results folder
    output_dir: str = "~/fedvls-runs"
    #: the run's folder under output-dir (default: dataset-method-skew-seed-time)
    run_name: str = ""
    #: continue the run in run-name from its last completed round
    resume: bool = False
    #: the local-update diagnostic (clients evaluate their updated model)
    local_eval: bool = False
    #: diagnostic: sites send their class counts (label distribution) with every reply (docs/methods.md)
    share_class_counts: bool = False
    #: also log every round's numbers for an experiment tracker (docs/tracking.md)
    tracking: str = "none"
    #: FedProx proximal weight mu: + (mu/2) ||w - w_global||^2
    fedprox_mu: float = 0.01
    #: MOON model-contrastive loss weight mu
    moon_mu: float = 0.01
    #: MOON temperature tau of the cosine similarities
    moon_tau: float = 0.5
    #: MOON projection head output size
    moon_projection_dim: int = 256
    #: FedRS: logits of the classes a client does not hold are scaled by alpha
    fedrs_alpha: float = 0.7
    #: FedRS scaling: 'binary' (absent classes x alpha) or 'proportional' (the authors' code)
    fedrs_form: str = "binary"
    #: FedLMD distillation weight beta
    fedlmd_beta: float = 0.1
    #: FedLMD temperature
    fedlmd_tau: float = 1.0
    #: mode of the frozen global model used as teacher ('train' = the FedVLS code)
    teacher_mode: str = "eval"
    #: FedDecorr decorrelation weight
    feddecorr_beta: float = 0.1
    #: FedMR intra-class decorrelation weight (deco; 4 in the FedVLS paper)
    fedmr_deco: float = 4.0
    #: FedLC margin scale tau (margin tau * n_c^(-1/4))
    fedlc_tau: float = 0.5
    #: FedLC softmax: 'standard' keeps the label in the denominator, 'paper' drops it
    fedlc_form: str = "standard"
    #: FedNTD distillation weight beta
    fedntd_beta: float = 1.0
    #: FedNTD temperature tau
    fedntd_tau: float = 1.0
    #: FedVLS vacant-class distillation weight (0.5 for CIFAR-100/TinyImageNet in the paper)
    lambda_dis: float = 0.1
    #: weight of the bounded logit suppression in fedvls
    logit_weight: float = 0.005
    #: FedVLS: keep the vacant-class distillation term (Table 5 ablation)
    use_dis: bool = True
    #: FedVLS: keep the logit suppression term (Table 5 ablation)
    use_logit: bool = True
    #: weight of the paper's (unbounded) logit suppression in fedvls-paper
    paper_logit_weight: float = 1.0
    #: FedSAM and FedGF client perturbation radius rho
    sam_rho: float = 0.1
    #: FedGF: distance rho_g of the perturbed global model from the global model
    fedgf_rho_g: float = 0.1
    #: FedGF: weight c of the perturbed global model in the SAM point (fixed mode)
    fedgf_c: float = 0.3
    #: FedGF: 'fixed' (c = fedgf-c) or 'adaptive' (the authors' code: from the divergence D)
    fedgf_c_mode: str = "fixed"
    #: FedGF adaptive c: threshold T_D on D = mean_k ||w_global - w_k||; no default: required with fedgf-c-mode='adaptive'
    fedgf_threshold: float = 0.0
    #: FedGF adaptive c: window W of rounds (the authors' script: 30)
    fedgf_window: int = 30
    #: FedExP epsilon in the server step size
    fedexp_eps: float = 0.01
    #: FedExP: evaluate the last global model, or the average of the last two (the paper)
    fedexp_eval: str = "last"
    #: FedAvgM server learning rate (Flower's default)
    fedavgm_lr: float = 1.0
    #: FedAvgM server momentum (Flower's default)
    fedavgm_momentum: float = 0.0
    #: fedadam server learning rate eta (Flower's default)
    fedadam_eta: float = 0.1
    #: fedadam first-moment decay (Flower's default)
    fedadam_beta1: float = 0.9
    #: fedadam second-moment decay (Flower's default)
    fedadam_beta2: float = 0.99
    #: fedadam adaptivity tau (Flower's default)
    fedadam_tau: float = 0.001
    #: fedyogi server learning rate eta (Flower's default)
    fedyogi_eta: float = 0.01
    #: fedyogi first-moment decay (Flower's default)
    fedyogi_beta1: float = 0.9
    #: fedyogi second-moment decay (Flower's default)
    fedyogi_beta2: float = 0.99
    #: fedyogi adaptivity tau (Flower's default)
    fedyogi_tau: float = 0.001
    #: fedadagrad server learning rate eta (Flower's default)
    fedadagrad_eta: float = 0.1
    #: fedadagrad adaptivity tau (Flower's default)
    fedadagrad_tau: float = 0.001
    #: FedConcat: number of clusters K (2 or 4 in the FedVLS paper)
    fedconcat_clusters: int = 2
    #: FedConcat: rounds of stage 1 (FedAvg inside each cluster); 0 = the authors' 1 : 20 split of num-server-rounds
    fedconcat_encoder_rounds: int = 0
    #: FedConcat stage 2: mini-batches per client and round on the head
    fedconcat_head_steps: int = 3
    #: FedConcat: the new head starts random, or from the clusters' heads side by side (the authors' CIFAR-100 start)
    fedconcat_head_init: str = "random"
    #: FedConcat: the cluster of partition 0, 1, ... ('0,1,0,1'); empty = K-means over the sites' label distributions
    fedconcat_assignment: str = ""
