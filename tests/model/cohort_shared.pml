/*
 * A Promela model of shared requests through the cohort (client/src/cohort.h, issue 19 item 4:
 * Client::Impl::CohortShare, ShareGrant, ReleaseRider), checked with spin (tests/model/check.sh).
 *
 * What it models: client A's NR reader threads and NW writer threads, and client B's one writer
 * thread, on one lock. The remote lock is lockd's word reduced to its four counters (DSLR): a
 * FETCH_AND_ADD draws (maxX, maxS); a shared request is granted once nX reaches its maxX, an
 * exclusive one once nX and nS reach its maxX and maxS; a release adds one to nS or nX. A's
 * threads share one cohort entry: `owned` and `contended` are the entry word's Key(slot) and
 * kContended, the mutex `emu` guards the writers' queue (a FIFO channel), `carrier` (a shared
 * grant readers may join), `joins` (joins of that grant) and `riders` (its readers).
 *   - A's writer: as cohort.pml (no tokens): owns a free entry and acquires from lockd, or queues
 *     and is served GRANTED (a handover) or REMOTE (the entry, without a grant); at release hands
 *     over to the first waiter (at most KMAX times per remote grant), else releases to lockd and
 *     leaves the entry (the first waiter becomes its owner, REMOTE).
 *   - A's reader: owns a free entry, acquires a shared grant from lockd and makes it the carrier
 *     (joins = 0, riders = 1); or finds the entry owned and, under the mutex, joins the carrier
 *     (riders + 1) if there is one, no writer queues (contended clear) and it had fewer than JMAX
 *     joins; else acquires a shared grant from lockd outside the cohort. A rider's release
 *     takes it off the carrier under the mutex; the last one clears the carrier, releases the
 *     grant to lockd and leaves the entry as a writer does. A shared grant is never handed to a
 *     writer (HandOver is for exclusive grants only).
 * B's writer draws its ticket and waits its turn.
 *
 * Properties (assertions): a writer holds alone (no other writer, no reader); a reader holds
 * with no writer; while B waits, A's readers join in-process at most JMAX times and A's writers
 * are handed the lock at most KMAX times (no starvation of another session). Invalid end states:
 * a thread left waiting for ever (a lost wakeup).
 * HANDSHARED=1 lets the last rider hand the shared grant to a queued writer as an exclusive
 * holder would: spin then finds a writer holding beside a reader. NOJOINBOUND=1 drops the join
 * bound: spin then finds B bypassed by more than JMAX joins.
 *
 * Run: spin -a cohort_shared.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan
 */
#ifndef NR
#define NR 2
#endif
#ifndef NW
#define NW 1
#endif
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef KMAX
#define KMAX 1
#endif
#ifndef JMAX
#define JMAX 1
#endif
#ifndef HANDSHARED
#define HANDSHARED 0
#endif
#ifndef NOJOINBOUND
#define NOJOINBOUND 0
#endif

#define WAITING 0
#define GRANTED 1
#define REMOTE 2

byte maxX, maxS, nX, nS;      /* the remote word's counters */
bool owned, contended;        /* the cohort entry's word */
bool emu;                     /* the entry's mutex */
chan q = [NW] of { byte };    /* the entry's waiting writers, FIFO */
byte out[NW];                 /* each waiting writer's outcome (guarded by emu) */
byte grun;                    /* local handovers of the current exclusive remote grant */
bool carrier;                 /* a shared grant readers may join (guarded by emu) */
byte joins, riders;           /* (guarded by emu) */
bool grant_shared;            /* a writer holds a shared grant (only in the HANDSHARED mutant) */
byte readers_in, writers_in;  /* ghost: holders now */
bool b_waiting;               /* ghost: B has drawn its ticket and waits */
byte b_joins, b_handovers;    /* ghost: A's in-process grants while B waits */

inline lock() { atomic { !emu -> emu = true } }
inline unlock() { emu = false }

inline enter_write() {
  atomic { assert(writers_in == 0 && readers_in == 0); writers_in++ }
  writers_in--
}
inline enter_read() {
  atomic { assert(writers_in == 0); readers_in++ }
}
inline leave_read() { readers_in-- }

/* CohortTable::Leave, by the entry's owner after its release to lockd. */
inline leave_entry(w) {
  if
  :: atomic { !contended -> owned = false }
  :: atomic { contended -> skip }
    lock();
    if
    :: len(q) == 0 -> owned = false; contended = false
    :: else ->
      q?w;
      if
      :: len(q) == 0 -> contended = false
      :: else -> skip
      fi;
      out[w] = REMOTE
    fi;
    unlock()
  fi
}

proctype Writer(byte me) {
  byte r, x, s, w;
  bool remote;
  for (r : 1 .. ROUNDS) {
    remote = false;
    if
    :: atomic { !owned -> owned = true; remote = true }
    :: atomic { owned -> skip }
      lock();
      atomic {
        if
        :: !owned -> owned = true; remote = true
        :: else -> contended = true
        fi
      }
      if
      :: remote -> unlock()
      :: else ->
        out[me] = WAITING;
        q!me;
        unlock();
        out[me] != WAITING;
        if
        :: out[me] == REMOTE -> remote = true
        :: else -> skip
        fi
      fi
    fi;
    if
    :: remote ->
      atomic { x = maxX; s = maxS; maxX++ };
      (nX == x && nS == s);
      atomic { grun = 0; grant_shared = false }
    :: else ->
      atomic { if :: b_waiting -> b_handovers++; assert(b_handovers <= KMAX) :: else -> skip fi }
    fi;
    enter_write();
    /* Client::Impl::HandOver (an exclusive grant) */
    if
    :: atomic { contended && grun < KMAX -> skip }
      lock();
      if
      :: len(q) > 0 ->
        q?w;
        if
        :: len(q) == 0 -> contended = false
        :: else -> skip
        fi;
        grun++;
        out[w] = GRANTED;
        unlock();
        goto next
      :: else -> unlock()
      fi
    :: else -> skip
    fi;
    /* released to lockd: the grant's own counter (a shared one only in the HANDSHARED mutant) */
    if
    :: grant_shared -> nS++
    :: else -> nX++
    fi;
    leave_entry(w);
next:
    skip
  }
}

proctype Reader() {
  byte r, x, w;
  bool own, joined;
  for (r : 1 .. ROUNDS) {
    own = false;
    joined = false;
    /* Client::Impl::CohortShare */
    if
    :: atomic { !owned -> owned = true; own = true }
    :: atomic { owned -> skip }
      lock();
      if
      :: carrier && !contended && (NOJOINBOUND || joins < JMAX) ->
        atomic {
          joins++;
          riders++;
          joined = true;
          if :: b_waiting -> b_joins++; assert(b_joins <= JMAX) :: else -> skip fi
        }
      :: else -> skip
      fi;
      unlock()
    fi;
    if
    :: own ->  /* acquire from lockd, then ShareGrant */
      atomic { x = maxX; maxS++ };
      nX == x;
      lock();
      atomic { carrier = true; joins = 0; riders = 1 };
      unlock()
    :: joined -> skip
    :: else ->  /* outside the cohort */
      atomic { x = maxX; maxS++ };
      nX == x
    fi;
    enter_read();
    leave_read();
    if
    :: own || joined ->  /* ReleaseRider */
      lock();
      riders--;
      if
      :: riders == 0 ->
        carrier = false;
        unlock();
#if HANDSHARED
        /* the mutant: the shared grant goes to a queued writer as an exclusive one would */
        lock();
        if
        :: len(q) > 0 ->
          q?w;
          if
          :: len(q) == 0 -> contended = false
          :: else -> skip
          fi;
          grun = 1;
          grant_shared = true;
          out[w] = GRANTED;
          unlock();
          goto next
        :: else -> unlock()
        fi;
#endif
        nS++;  /* the carrier's grant released to lockd */
        leave_entry(w)
      :: else -> unlock()
      fi
    :: else -> nS++
    fi;
next:
    skip
  }
}

proctype B() {
  byte x, s;
  atomic { x = maxX; s = maxS; maxX++; b_waiting = true; b_joins = 0; b_handovers = 0 };
  (nX == x && nS == s);
  b_waiting = false;
  enter_write();
  nX++
}

init {
  byte i;
  atomic {
    for (i : 0 .. NW - 1) {
      run Writer(i)
    }
    for (i : 1 .. NR) {
      run Reader()
    }
    run B()
  }
}
