/* xdp_lb_maps.h — the load balancer's maps, each with its key, value and who
 * writes it. Included once, by xdp_lb.bpf.c: the map calls stay there (BCC
 * turns `map.lookup()` into a helper call only in the file it compiles). */
#ifndef XDP_LB_MAPS_H
#define XDP_LB_MAPS_H

/* (VIP, port, proto, family) -> service id; user space (add_service) */
BPF_HASH(services, struct lb_service_key, struct lb_service, LB_MAX_SERVICES);
/* service id -> what its replies leave as; user space */
BPF_ARRAY(service_info, struct lb_service_info, LB_MAX_SERVICES);
/* every VIP, so that a fragment or a cut-short header to one is dropped, not passed; user space */
BPF_HASH(vip_addrs, struct lb_addr, __u8, LB_MAX_SERVICES);
/* service id * LB_RING_SIZE + slot -> backend index (0: none): the Maglev tables; user space (ebpf/lb/maglev.py) */
BPF_ARRAY(rings, __u32, LB_MAX_SERVICES * LB_RING_SIZE);
/* backend index -> address, port, family; user space */
BPF_ARRAY(backends, struct lb_backend, LB_MAX_BACKENDS);
/* index 0 -> the LB's own addresses, its port range, the timeouts; user space */
BPF_ARRAY(conf, struct lb_conf, 1);
/* established sessions: the client's flow -> its backend, LB port, state; the program (user space sweeps) */
BPF_TABLE("lru_hash", struct lb_flow_key, struct lb_session, sessions, LB_MAX_SESSIONS);
/* SYN-created sessions, apart, so that a SYN flood evicts only these; the program */
BPF_TABLE("lru_hash", struct lb_flow_key, struct lb_session, half_open, LB_MAX_HALF_OPEN);
/* NAT: (backend, its port, LB port) -> the client's flow, for the replies of an established session; the program */
BPF_TABLE("lru_hash", struct lb_reverse_key, struct lb_flow_key, reverse, LB_MAX_REVERSE);
/* NAT: the same for half-open sessions; the program */
BPF_TABLE("lru_hash", struct lb_reverse_key, struct lb_flow_key, reverse_half, LB_MAX_REVERSE_HALF);
/* index 0 -> verdicts, reasons and session events (struct lb_stats), per CPU; the program */
BPF_PERCPU_ARRAY(stats, struct lb_stats, 1);
/* index 0 -> 1 in generic mode: frames leave as skbs (rewrite_helpers.h); user space, before it attaches */
BPF_ARRAY(skb_mode, __u32, 1);
/* index 0 -> where a partial checksum is finished (rewrite_helpers.h), per CPU; the program */
BPF_PERCPU_ARRAY(csum_scratch, struct csum_block, 1);
/* backend index -> the same per backend (python -m lab lb's table), per CPU; the program */
BPF_PERCPU_ARRAY(backend_stats, struct lb_traffic, LB_MAX_BACKENDS);

#endif /* XDP_LB_MAPS_H */
