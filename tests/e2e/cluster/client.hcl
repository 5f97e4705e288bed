# Each of the cluster's two clients (tests/e2e/nomad_cluster.sh), merged with a generated file
# that sets what must differ between two agents on one machine: name, data_dir, ports,
# cgroup_parent, the server's address, its node meta (zfs_parent: the parent dataset on the
# client's own pool) and the exec driver's chroot_env. Loopback only.
bind_addr = "127.0.0.1"

advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}

client {
  enabled = true

  # Cloud and Consul/Vault fingerprints only slow the start (and env_aws fails with
  # AWS_CA_BUNDLE set).
  options = {
    "driver.allowlist"     = "raw_exec,exec"
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean,consul,vault"
  }
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}

disable_update_check = true
