/* native.c — the load balancer's user-space loops over whole tables, in C, so
 * that neither a change of backends nor the session sweep costs a core (or
 * numpy's 14 MB in every LB process). Built with cc on first use into a shared
 * library (ebpf/ctools.py), called through ctypes:
 *
 *   maglev_fill()    Maglev's table population (ebpf/lb/maglev.py, whose pure-
 *                    Python maglev_table() is the reference: the tests compare)
 *   ring_diff()      the slots where a new table differs from the map's
 *   sessions_scan()  a batch of sessions read from the map: which are idle past
 *                    their timeout, and the live ones counted per backend
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* table[size]: each slot index[o] for the backend of ordinal o (0..n-1) holding
 * it. Returns 0, or -1 when memory ran out. Every weight is > 0, n >= 1,
 * n <= size, size a prime, offset[i] < size, 1 <= skip[i] < size. */
int maglev_fill(uint32_t size, uint32_t n, const uint32_t *offset, const uint32_t *skip,
		const uint64_t *weight, const uint32_t *index, uint32_t *table)
{
	/* where each backend's walk is (its next candidate slot), and its credit */
	uint64_t *at = malloc(n * sizeof(*at));
	uint64_t *credit = calloc(n, sizeof(*credit));
	uint8_t *taken = calloc(size, 1);
	uint64_t wmax = 0;
	uint32_t filled = 0;

	if (!at || !credit || !taken) {
		free(at);
		free(credit);
		free(taken);
		return -1;
	}
	for (uint32_t i = 0; i < n; i++) {
		at[i] = offset[i];
		if (weight[i] > wmax)
			wmax = weight[i];
	}
	for (;;) {
		for (uint32_t i = 0; i < n; i++) {
			credit[i] += weight[i];
			if (credit[i] < wmax)
				continue;
			credit[i] -= wmax;
			/* the next free slot of its permutation, (offset + k * skip) % size
			 * for k its turns so far, kept as a running position */
			while (taken[at[i]])
				at[i] = (at[i] + skip[i]) % size;
			taken[at[i]] = 1;
			table[at[i]] = index[i];
			at[i] = (at[i] + skip[i]) % size;
			if (++filled == size) {
				free(at);
				free(credit);
				free(taken);
				return 0;
			}
		}
	}
}

/* The slots i where old[i] != new[i], in order: their keys in the map (base + i)
 * into keys, new[i] into values, ready for one BPF_MAP_UPDATE_BATCH; returns how many. */
uint32_t ring_diff(uint32_t size, uint32_t base, const uint32_t *old, const uint32_t *new, uint32_t *keys,
		   uint32_t *values)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < size; i++)
		if (old[i] != new[i]) {
			keys[n] = base + i;
			values[n++] = new[i];
		}
	return n;
}

/* The layout of struct lb_session (ebpf/lb/xdp_lb.h) and what its timeouts are,
 * as user space reads them from its ctypes type: offsets, not a copy of the struct. */
struct scan_conf {
	uint32_t size;          /* sizeof(struct lb_session) */
	uint32_t last_seen;     /* offsets */
	uint32_t backend;
	uint32_t state;
	uint32_t closing;       /* two bytes: the client's, the backend's */
	uint32_t st_syn, st_udp, cl_fin;
	uint64_t timeout[4];    /* ns: syn, established, fin, udp */
};

/* n sessions, packed: the idle ones' positions into expired (returns how many),
 * each live one counted in live[its backend] (backends above max_backend not). */
uint32_t sessions_scan(const struct scan_conf *c, const uint8_t *values, uint32_t n, uint64_t now,
		       uint32_t max_backend, uint64_t *live, uint32_t *expired)
{
	uint32_t gone = 0;

	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *v = values + (uint64_t)i * c->size;
		uint64_t seen, timeout;
		uint32_t backend;
		uint8_t state = v[c->state] & 0x0F;
		int fin = ((v[c->closing] | v[c->closing + 1]) & c->cl_fin) != 0;

		memcpy(&seen, v + c->last_seen, sizeof(seen));
		memcpy(&backend, v + c->backend, sizeof(backend));
		if (fin && state != c->st_udp)
			timeout = c->timeout[2];
		else if (state == c->st_syn)
			timeout = c->timeout[0];
		else if (state == c->st_udp)
			timeout = c->timeout[3];
		else
			timeout = c->timeout[1];
		/* a session seen after `now` was read (another CPU, meanwhile) is not idle */
		if (now > seen && now - seen > timeout)
			expired[gone++] = i;
		else if (backend <= max_backend)
			live[backend]++;
	}
	return gone;
}
