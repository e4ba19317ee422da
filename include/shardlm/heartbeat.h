// heartbeat.h: a rank's "still running" signal for `shardlm launch --hang-timeout` (docs/launch.md).
//
// The launcher's worker wrapper names a file in SHARDLM_HEARTBEAT_FILE. sl_heartbeat_start opens it
// and starts a background thread that rewrites it every SHARDLM_HEARTBEAT_INTERVAL_MS milliseconds
// (default 1000) with one fixed-size record,
//     beat <counter> pid <pid> step <step> <what>
// where step and what are the last progress the training loop reported. The thread keeps beating
// while the main thread sits in a long collective, a checkpoint save or an evaluation, so the
// heartbeat stops only when the process stops running (SIGSTOP, a frozen machine, a file system
// that hangs under the heartbeat file). The wrapper takes a record that has not changed for the
// hang timeout as a hung rank. Without SHARDLM_HEARTBEAT_FILE every call does nothing.
// Any program can take part: rewriting the file with changing content is the whole protocol.
#ifndef SHARDLM_HEARTBEAT_H
#define SHARDLM_HEARTBEAT_H

#include <stdint.h>

#define SL_HEARTBEAT_RECORD 96  // bytes per record, newline included

// Starts beating when SHARDLM_HEARTBEAT_FILE is set; 0 when it is not. -1 with a message when the
// file cannot be opened or the thread not started (the caller may go on without a heartbeat).
int sl_heartbeat_start(void);
// Records the progress the next beats report; `what` must outlive the heartbeat (a string literal).
void sl_heartbeat_progress(int64_t step, const char *what);
// Stops the thread and closes the file (the file stays).
void sl_heartbeat_stop(void);

#endif
