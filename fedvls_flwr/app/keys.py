"""What server and clients say to each other: record keys and metric names, in one place.

A training message carries the global weights (ArrayRecord ``ARRAYS``) and the whole
validated run config plus the round (ConfigRecord ``CONFIG``); the reply carries the
trained weights (``ARRAYS``) and a MetricRecord ``METRICS`` with the names below. An
evaluation reply carries only ``METRICS`` (per-class counts, so the server can pool them).
Flower-free: plain strings.
"""

from __future__ import annotations

# record keys of a message's RecordDict
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# what a part's server companion sends with the weights (algorithms/downlink.py): arrays in an
# ArrayRecord DOWNLINK and scalar values in a ConfigRecord DOWNLINK_VALUES
DOWNLINK = "downlink"
DOWNLINK_VALUES = "downlink-values"

# config record: the run config's keys plus
SERVER_ROUND = "server-round"
WANT_SHARES = "want-shares"  # a query's: the per-site statistics asked for (comma-separated)

# training reply metrics
NUM_EXAMPLES = "num-examples"  # the weight of this reply in the average
TRAIN_LOSS = "train-loss"
TRAIN_TERM_PREFIX = "train-"  # + each loss term's name (train-cal, train-dis, ...)
PARTITION_ID = "partition-id"  # identity (the node's partition or site), not a quantity
# the site's label distribution: only with share-class-counts (app/site_counts.py), or in a
# query that asks for the statistics the run's parts declare (FedConcat's class counts)
NUM_VACANT = "num-vacant"
CLASS_COUNTS = "class-counts"
LOCAL_PER_CLASS_ACCURACY = "local-per-class-accuracy"  # with local-eval

# evaluation reply metrics (federated evaluation)
LOSS_SUM = "loss-sum"
CORRECT_PER_CLASS = "correct-per-class"
TOTAL_PER_CLASS = "total-per-class"

PEAK_GPU_MB = "peak-gpu-mb"  # torch.cuda.max_memory_allocated of the round, MiB (CUDA clients only)

# a training or query reply's ConfigRecord CLIENT_INFO: what the client is, in words
CLIENT_INFO = "client-info"
DEVICE = "device"  # algorithms.device.describe_device: "cuda:0 (NVIDIA ...)", "cpu", ...
NODE = "node"  # where the client ran: "ray:<Ray node id>" in a Ray actor, else the host name (client.where_it_runs)

#: Reply metrics that are not averaged over the clients: identity, and the peak GPU memory
#: (the round reports the largest, the figure to size client-resources-num-gpus by).
NOT_AVERAGED = (PARTITION_ID, PEAK_GPU_MB)

# a node's Context.state between rounds: one ArrayRecord per kind of part that keeps something
# ("fedvls-state/method": MOON's previous model; "fedvls-state/local-optimizer": carried momentum;
# "fedvls-state/protocol": FedConcat's frozen encoders), the part's own state dict
CLIENT_STATE = "fedvls-state/"
