#!/usr/bin/env bash
# The VPC network cluster/gcp.yaml launches into, with the only two ingress rules it needs:
# SSH (22) for the launcher and `ray dashboard` tunnels, and any traffic between nodes tagged
# `distributed-emb` (GCS 6379, object manager, workers). Nothing else is reachable from
# outside: the dashboard (8265) and Ray client (10001) are used through the SSH tunnel.
#
# Run once per project (idempotent commands are not assumed: a second run reports "already
# exists"):
#   PROJECT=my-project REGION=us-west1 bash cluster/gcp_network.sh
# Narrow SSH to your own address with SSH_SOURCE_RANGES=203.0.113.7/32.
#
# tests/cluster/test_launcher_configs.py reads the firewall rules below, so keep each gcloud
# command on one line.
set -euo pipefail

PROJECT="${PROJECT:?set PROJECT to your GCP project id}"
REGION="${REGION:-us-west1}"
SSH_SOURCE_RANGES="${SSH_SOURCE_RANGES:-0.0.0.0/0}"

gcloud compute networks create distributed-emb --project="$PROJECT" --subnet-mode=custom
gcloud compute networks subnets create distributed-emb --project="$PROJECT" --network=distributed-emb --region="$REGION" --range=10.20.0.0/20
gcloud compute firewall-rules create distributed-emb-ssh --project="$PROJECT" --network=distributed-emb --direction=INGRESS --allow=tcp:22 --source-ranges="$SSH_SOURCE_RANGES" --target-tags=distributed-emb
gcloud compute firewall-rules create distributed-emb-internal --project="$PROJECT" --network=distributed-emb --direction=INGRESS --allow=tcp,udp,icmp --source-tags=distributed-emb --target-tags=distributed-emb
