/*
 * staged_dir.h - an output directory that appears whole or not at all.
 *
 * A command that writes a directory (`petrel convert`) builds it in a hidden
 * sibling, PARENT/.NAME.petrel-tmp-PID, and renames that to PARENT/NAME only
 * when everything succeeded.  So DST is always absent, its old self, or
 * complete:
 *   - SIGINT, SIGTERM and SIGHUP remove the staging directory, then the
 *     process dies of the signal as it would have;
 *   - a staging directory left by a run that could not clean up (SIGKILL,
 *     a crash, power loss) is removed by the next staged_begin for the same
 *     DST, once no process has its pid;
 *   - with replace, an existing DST is swapped out at commit and deleted.
 * The staging directory is flat (files only): the signal handler removes it
 * with async-signal-safe calls, and it must not meet subdirectories there.
 * One staged directory per process at a time.
 */
#ifndef PETREL_STAGED_DIR_H
#define PETREL_STAGED_DIR_H

#include <stdbool.h>

#include "base/base.h"

/* Checks DST (an existing DST is an error unless replace), sweeps stale
 * staging directories, creates the staging directory and arms the signal
 * handlers.  *tmp is the directory to write into (static storage). */
int staged_begin(const char *dst, bool replace, const char **tmp, pt_err *err);
/* Renames the staging directory to DST (replacing the old DST when allowed)
 * and disarms the handlers. */
int staged_commit(pt_err *err);
/* Removes the staging directory and disarms the handlers; a no-op when
 * nothing is staged. */
void staged_abort(void);

#endif
