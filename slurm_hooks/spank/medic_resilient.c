/*
 * medic_resilient: the SPANK plugin behind `sbatch/srun/salloc --resilient[=N]`.
 *
 * N is how many automatic restarts Medic may give the job (a bare --resilient means
 * MEDIC_RESILIENT_DEFAULT). SPANK cannot make a job requeueable or set its comment, so the
 * work is split:
 *   - the option callback, in the submitting client, exports MEDIC_RESILIENT_REQUEST=N;
 *     cli_filter.lua (CliFilterPlugins=cli_filter/lua) reads it in slurm_cli_pre_submit and
 *     sets --requeue and the comment tag `medic:resilient=N`;
 *   - slurm_spank_init_post_opt, still in the client and after pre_submit, unsets that
 *     variable again and passes N to the job's control environment: the prolog and epilog
 *     see SPANK_RESILIENT=N, the batch job SLURM_SPANK_RESILIENT=N.
 * In slurmd and slurmstepd the plugin only registers the option.
 *
 * Build: see slurm_hooks/spank/build.py (gcc -shared -fPIC against libslurm-dev's spank.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

#ifndef MEDIC_RESILIENT_DEFAULT
#define MEDIC_RESILIENT_DEFAULT 3
#endif
#define MEDIC_RESILIENT_MAX 1000
#define STR_(x) #x
#define STR(x) STR_(x)

/* The variable cli_filter.lua reads; keep in sync with cli_filter.lua. */
#define REQUEST_ENV "MEDIC_RESILIENT_REQUEST"

SPANK_PLUGIN(medic_resilient, 1);

static int restarts = -1; /* -1: --resilient not given */

static int parse_restarts(const char *arg)
{
	char *end = NULL;
	long n;

	/* A bare --resilient passes NULL, or the literal "(null)" from #SBATCH lines. */
	if (arg == NULL || *arg == '\0' || strcmp(arg, "(null)") == 0)
		return MEDIC_RESILIENT_DEFAULT;
	errno = 0;
	n = strtol(arg, &end, 10);
	if (errno != 0 || end == arg || *end != '\0' || n < 0 || n > MEDIC_RESILIENT_MAX)
		return -1;
	return (int) n;
}

static int resilient_cb(int val, const char *optarg, int remote)
{
	char value[16];
	int n = parse_restarts(optarg);

	(void) val;
	if (n < 0) {
		slurm_error("--resilient=%s: expected a number of restarts from 0 to %d "
			    "(or a bare --resilient for %d)",
			    optarg, MEDIC_RESILIENT_MAX, MEDIC_RESILIENT_DEFAULT);
		return -1;
	}
	restarts = n;
	if (!remote) {
		snprintf(value, sizeof(value), "%d", n);
		if (setenv(REQUEST_ENV, value, 1) != 0) {
			slurm_error("medic_resilient: cannot set %s", REQUEST_ENV);
			return -1;
		}
	}
	return 0;
}

static struct spank_option resilient_option = {
	"resilient",
	"[N]",
	"Requeue this job on a healthy node after a node failure, up to N times "
	"(default " STR(MEDIC_RESILIENT_DEFAULT) "), resuming from its last checkpoint (Medic).",
	2, /* the argument is optional */
	0,
	resilient_cb,
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void) ac;
	(void) av;
	if (spank_option_register(sp, &resilient_option) != ESPANK_SUCCESS) {
		slurm_error("medic_resilient: cannot register --resilient");
		return -1;
	}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char value[16];
	spank_context_t ctx = spank_context();

	(void) ac;
	(void) av;
	/* cli_filter's pre_submit has run by now: drop the request so the job's environment
	 * does not carry it into a nested sbatch. */
	unsetenv(REQUEST_ENV);
	if (restarts < 0 || (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL))
		return 0;
	snprintf(value, sizeof(value), "%d", restarts);
	if (spank_job_control_setenv(sp, "RESILIENT", value, 1) != ESPANK_SUCCESS)
		slurm_error("medic_resilient: cannot pass RESILIENT=%s to the job", value);
	return 0;
}
