# The cluster's one server (tests/e2e/nomad_cluster.sh), merged with a generated file that sets
# its name, data_dir and ports. Loopback only.
bind_addr = "127.0.0.1"

advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}

server {
  enabled          = true
  bootstrap_expect = 1
  # A client that stops heartbeating is marked down after about 10 s rather than 20 to 30:
  # the lost-node step waits for that.
  min_heartbeat_ttl = "5s"
  heartbeat_grace   = "5s"
  # The claim of an allocation lost with its node is freed only by the periodic claim GC (every
  # 5 minutes by default, for volumes unchanged for 5 minutes); until then the replacement
  # allocation fails to claim the volume ("volume max claims reached"). Here every 15 s.
  csi_volume_claim_gc_interval  = "15s"
  csi_volume_claim_gc_threshold = "10s"
}

disable_update_check = true
