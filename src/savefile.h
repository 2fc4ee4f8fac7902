/*
 * savefile.h -- replacing a user's file without ever losing it.
 *
 * A save writes a temporary file next to the file it replaces ("<target>.tmp.<pid>.<n>"), makes it
 * durable (fsync) and renames it over the target, so the old file stays whole until the new one is
 * complete. The target is the path, or the file its symbolic links lead to (the links stay links);
 * only a regular file (or a missing one) is ever replaced: a FIFO, a device, a socket or a directory
 * at the path is an error before anything is written, and so is a file this process may not write
 * (as open(path, "w") would refuse it). The new file keeps the old one's permissions and, where the
 * process may set them, its owner and group; a hard link to the old file keeps the old contents. On
 * any failure the temporary file is removed and the path is left as it was. Errors are TG_ERR_IO,
 * "fn: path: what".
 */
#ifndef TG_SAVEFILE_H
#define TG_SAVEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "helpers.h"

typedef struct {
  const char *fn;   /* the public function saving, for messages */
  const char *path; /* as the caller gave it */
  char *target;     /* the file the rename replaces */
  char *tmp;        /* the temporary file (NULL once renamed or removed) */
  int fd;           /* open on tmp until savefile_finish */
} SaveFile;

/* Checks path (a regular file, a missing one, or a link chain to either) and creates the temporary
 * file. On failure sets the error and leaves f with nothing to abort. */
tg_status savefile_open(SaveFile *f, const char *fn, const char *path);
/* Appends n bytes; on failure sets the error (the old file untouched) and returns it. */
tg_status savefile_write(SaveFile *f, const void *p, size_t n);
/* fsync and close the temporary file (still under its temporary name). */
tg_status savefile_finish(SaveFile *f);
/* Renames the finished temporary file over the target and syncs the directory (best effort). */
tg_status savefile_rename(SaveFile *f);
/* Closes and removes the temporary file if there still is one, and frees f's memory. Always safe,
 * after success too. */
void savefile_close(SaveFile *f);
/* Do two opened saves replace the same file (through links, "..", or another spelling)? */
bool savefile_same_target(const SaveFile *a, const SaveFile *b);

/* What kind of file a st_mode is, for messages ("a regular file", "a directory", "a FIFO", ...). */
const char *file_kind(unsigned mode);
/* write(2) until done, retrying on EINTR; false with errno set on failure. */
bool fd_write_all(int fd, const void *p, size_t n);

/* Files the library reads and writes on its own (kernel caches, traces), in directories other users
 * may share:
 * file_read_regular -- the whole of path if it is a regular file of at most max bytes (malloc'd,
 *   *len set); NULL otherwise, with no error set and nothing read past the check: the open does not
 *   wait on a FIFO, and a huge entry is refused before any memory is taken for it.
 * file_create_new -- creates path for writing (mode & ~umask), or -1 if anything is there already:
 *   a link planted at a predictable temporary name is never followed (O_EXCL). */
unsigned char *file_read_regular(const char *path, size_t max, size_t *len);
int file_create_new(const char *path, unsigned mode);

#endif
