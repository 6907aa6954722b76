/*
 * A Promela model of cohort handover inside one client (client/src/cohort.h, issue 19 item 4),
 * checked with spin (tests/model/check.sh).
 *
 * What it models: client A's NT threads and client B's one thread want one exclusive lock. The
 * remote lock is a FIFO ticket lock (lockd's word, as rdmalock.pml models it in detail: here a
 * FETCH_AND_ADD draws a ticket, a holder's release moves the turn on). A's threads share a cohort
 * entry: `owned` and `contended` are the entry word's Key(slot) and kContended; the entry mutex
 * `emu` guards the queue (a FIFO channel) and every change of the word while contended is set.
 *   - acquire: a CAS of the free entry makes the thread the owner, which draws a ticket; a thread
 *     that finds the entry owned takes the mutex, sets contended (or takes the entry, if it was
 *     freed meanwhile) and queues; it is served with GRANTED (a handover: the grant is its own
 *     now) or REMOTE (the entry is its own, without a grant: it draws a ticket); or it times out
 *     (nondeterministically), taking itself out of the queue under the mutex, and gives up.
 *   - release: with contended set and fewer than KMAX local handovers of this grant, the holder
 *     takes the mutex and hands the grant to the first waiter (HandOver); otherwise it releases
 *     to lockd, then leaves the entry: a CAS from owned (uncontended) to free, else under the
 *     mutex the first waiter becomes the owner (REMOTE), or the entry is freed.
 * B's thread draws its ticket and waits its turn.
 *
 * Fencing tokens (protocol version 5): a remote grant's token is its ticket with 0 in the low
 * bits, the k-th handover's holder gets the same ticket with k there ((ticket + 1) * 16 + k here).
 * Each of A's requests wants a token or not (nondeterministically); a grant acquired without one
 * is not handed to a waiter that wants one (HandOver leaves it, and the waiter acquires from
 * lockd as REMOTE).
 *
 * Properties (assertions): never two holders at once (A's local and remote ones and B); while B
 * waits for its turn, A's threads enter the lock at most KMAX + 1 times (the grant ahead of B and
 * its KMAX handovers); every holder that wanted a token has one, larger than every earlier
 * holder's. Invalid end states: no thread waits for ever (every waiter is served or
 * times out; nobody holds the entry at the end).
 * TIMEOUTS=0: waiters never give up, so a waiter left unserved (a lost wakeup) is an invalid
 * end state.
 * TOKENS=0 leaves tokens out (no request wants one): a smaller state space for the runs with
 * more threads and rounds.
 * NOBOUND=1 drops the bound (handovers for as long as threads wait): spin then finds B bypassed
 * more than KMAX + 1 times. NOLOCAL=1 gives a handed-over holder the remote grant's token as it
 * is (no handover number in the low bits): spin then finds a token no larger than the last.
 *
 * Run: spin -a cohort.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan
 */
#ifndef NT
#define NT 3
#endif
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef KMAX
#define KMAX 2
#endif
#ifndef NOBOUND
#define NOBOUND 0
#endif
#ifndef TIMEOUTS
#define TIMEOUTS 1
#endif
#ifndef NOLOCAL
#define NOLOCAL 0
#endif
#ifndef TOKENS
#define TOKENS 1
#endif

#define WAITING 0
#define GRANTED 1
#define REMOTE 2

byte next_ticket, serving;  /* the remote ticket lock */
bool owned, contended;      /* the cohort entry's word */
bool emu;                   /* the entry's mutex */
chan q = [NT] of { byte };  /* the entry's waiters, FIFO */
byte out[NT];               /* each waiter's outcome (guarded by emu) */
byte grun;                  /* local handovers of the current remote grant (travels with it) */
byte in_cs;                 /* ghost: holders now */
bool b_waiting;             /* ghost: B has drawn its ticket and waits */
byte bypass;                /* ghost: A's entries while B waits */
bool wtok[NT];              /* A's request wants a fencing token (set before it queues) */
byte gtick;                 /* the current remote grant's ticket (travels with it, as grun) */
bool ghas;                  /* the current remote grant has a token (its owner wanted one) */
byte last_tok;              /* ghost: the largest token a holder had so far */

inline lock() { atomic { !emu -> emu = true } }
inline unlock() { emu = false }

/* A holder enters; tok is its fencing token, 0 if it has none. */
inline enter(tok) {
  atomic {
    in_cs++;
    assert(in_cs == 1);
#if TOKENS
    if
    :: tok != 0 -> assert(tok > last_tok); last_tok = tok
    :: else -> skip
    fi;
#endif
    if
    :: b_waiting -> bypass++; assert(bypass <= KMAX + 1)
    :: else -> skip
    fi
  }
  in_cs--
}

proctype A(byte me) {
  byte r, t, w;
  bool remote;
  for (r : 1 .. ROUNDS) {
    remote = false;
#if TOKENS
    if
    :: wtok[me] = true
    :: wtok[me] = false
    fi;
#endif
    /* CohortTable::TryOwn */
    if
    :: atomic { !owned -> owned = true; remote = true }
    :: atomic { owned -> skip }
      /* CohortTable::Wait */
      lock();
      /* One CAS on the word: from free to owned, or from owned to owned and contended (an
         owner's lock-free Leave may free it between the check and the change otherwise). */
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
        if
        :: out[me] != WAITING
#if TIMEOUTS
        :: lock();
          if
          :: out[me] == WAITING ->  /* timed out: leave the queue */
            q??eval(me);
            if
            :: len(q) == 0 -> contended = false
            :: else -> skip
            fi;
            out[me] = 3  /* gave up */
          :: else -> skip    /* served meanwhile: take it */
          fi;
          unlock()
#endif
        fi;
        if
        :: out[me] == REMOTE -> remote = true
        :: else -> skip
        fi
      fi
    fi;
    if
    :: out[me] == 3 && !remote -> out[me] = WAITING; goto next  /* kTimeout */
    :: else -> skip
    fi;
    if
    :: remote ->  /* the owner acquires from lockd */
      atomic { t = next_ticket; next_ticket++ };
      serving == t;
      grun = 0;
#if TOKENS
      atomic { gtick = t; ghas = wtok[me] }
#endif
    :: else -> skip  /* handed over: the grant (and run) came with it */
    fi;
    /* A token-wanting holder was never handed a grant without one (HandOver checks ghas). */
    assert(!wtok[me] || ghas);
    if
    :: wtok[me] -> enter((gtick + 1) * 16 + grun * (1 - NOLOCAL))
    :: else -> enter(0)
    fi;
    /* Client::Impl::HandOver */
    if
    :: atomic { contended && (NOBOUND || grun < KMAX) -> skip }
      lock();
      if
      :: len(q) > 0 ->
        q?<w>;  /* the first waiter, still queued */
        if
        :: ghas || !wtok[w] ->  /* a waiter that wants a token needs a grant that has one */
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
      :: else -> unlock()
      fi
    :: else -> skip
    fi;
    /* released to lockd, then CohortTable::Leave */
    serving++;
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
    fi;
next:
    skip
  }
}

proctype B() {
  byte t;
  atomic { t = next_ticket; next_ticket++; b_waiting = true; bypass = 0 };
  serving == t;
  b_waiting = false;
  enter((t + 1) * 16);
  serving++
}

init {
  byte i;
  atomic {
    for (i : 0 .. NT - 1) {
      run A(i)
    }
    run B()
  }
}
