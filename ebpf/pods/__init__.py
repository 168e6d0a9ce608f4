"""The pod datapath: TcPods (tc_pods.py, tc_pods.bpf.c, tc_pods.h), pods connected on a
node as Cilium connects them: into a pod on this node by its veth's peer
(bpf_redirect_peer), to another node's pod by the FIB (native routing) or through a
VXLAN device (tunnel mode), everything else to the kernel."""
